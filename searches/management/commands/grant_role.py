"""`python manage.py grant_role USERNAME ROLE [--revoke]`: give (or take) a user's role.

Roles are the groups `engineers` and `reviewers` (docs/deploy.md, "Who may do what"). The same
can be done in the admin by a user allowed to change users."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core import roles
from core.errors import DomainError
from searches import services


class Command(BaseCommand):
    help = "Give a user a role (engineers, reviewers), or take it with --revoke."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("role", help=f"one of: {', '.join(roles.ROLES)}")
        parser.add_argument("--revoke", action="store_true", help="take the role away")

    def handle(self, *args, username, role, revoke, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        try:
            if revoke:
                services.revoke_role(user=user, role=role)
            else:
                services.grant_role(user=user, role=role)
        except DomainError as e:
            raise CommandError(f"unknown role {role!r}: use one of {', '.join(roles.ROLES)}") from e
        now = sorted(user.groups.values_list("name", flat=True))
        self.stdout.write(f"{username}: {', '.join(now) or 'no role'}")
