"""Helpers both web apps use: roles, domain errors, safe HTML rendering, pagination, JSON that
both databases store, number formatting for templates, and the control plane of the `search`
queue (`core.control`). `core` imports neither `searches` nor `library`
(docs/architecture.md)."""
