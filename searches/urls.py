from __future__ import annotations

from django.urls import path

from searches import views, views_charts
from searches.agent import views as agent_views

app_name = "searches"
urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("ideas/", views.idea_list, name="ideas"),
    path("ideas/new", views.idea_new, name="idea_new"),
    path("ideas/<int:pk>", views.idea_detail, name="idea"),
    path("ideas/<int:pk>/start", views.idea_start, name="idea_start"),
    path("searches/<int:pk>", views.search_detail, name="search"),
    path("searches/<int:pk>/pause", views.search_pause, name="search_pause"),
    path("searches/<int:pk>/resume", views.search_resume, name="search_resume"),
    path("searches/<int:pk>/stop", views.search_stop, name="search_stop"),
    path("searches/<int:pk>/trials/<int:index>", views.trial_detail, name="trial"),
    path("searches/<int:pk>/compare", views.trial_compare, name="compare"),
    path("searches/<int:pk>/llm", agent_views.search_llm, name="search_llm"),
    path("searches/<int:pk>/notes", agent_views.search_note, name="search_note"),
    path("packs", agent_views.pack_list, name="packs"),
    path("packs/<str:kind>/new", agent_views.pack_edit, name="pack_new"),
    path("packs/<str:kind>/<str:name>", agent_views.pack_edit, name="pack"),
    path("problems", views.problem_list, name="problems"),
    path("problems/<str:name>", views.problem_detail, name="problem"),
    path("workers", views.workers, name="workers"),
    path("gpus", views_charts.gpus, name="gpus"),
    path("charts/dashboard", views_charts.dashboard_charts, name="dashboard_charts"),
    path("charts/problems/<str:name>", views_charts.problem_charts, name="problem_charts"),
    path("searches/<int:pk>/charts", views_charts.search_charts, name="search_charts"),
]
