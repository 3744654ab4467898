from __future__ import annotations

from django.urls import path

from searches import views

app_name = "searches"
urlpatterns = [
    path("", views.dashboard, name="dashboard"),
]
