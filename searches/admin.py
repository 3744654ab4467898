"""Admin registrations; the models they register arrive with the web issue."""
