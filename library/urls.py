from __future__ import annotations

from django.urls import path

from library import views

app_name = "library"
urlpatterns = [
    path("reviews/", views.queue, name="queue"),
    path("reviews/trials/<int:pk>", views.review, name="review"),
    path("reviews/trials/<int:pk>/decide", views.decide, name="decide"),
    path("releases/", views.releases, name="releases"),
    path("releases/<int:pk>", views.release, name="release"),
    path("releases/<int:pk>/revoke", views.revoke, name="revoke"),
    path("releases/download", views.download, name="download"),
]
