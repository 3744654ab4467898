"""`manage.py rotate_llm_keys`: re-encrypt every stored API key under the first key of
AUTOWEB_ENCRYPTION_KEYS (and encrypt any still in plain text). Safe to run while the site runs,
and to run again: a key changed meanwhile by its search page is already under the first key."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from searches import crypto
from searches.models import Idea, Search


class Command(BaseCommand):
    help = "Re-encrypt stored API keys under the first key of AUTOWEB_ENCRYPTION_KEYS."

    def handle(self, *args, **options):
        done, unreadable = 0, []
        for model in (Search, Idea):
            rows = model.objects.exclude(llm_api_key="").values_list("pk", "llm_api_key")
            for pk, stored in rows.iterator():
                try:
                    fresh = crypto.reencrypt(stored)
                except crypto.KeyUnreadable:
                    unreadable.append(f"{model._meta.model_name} {pk}")
                    continue
                # Only if unchanged since read: a concurrent switch wrote a fresh value itself.
                done += model.objects.filter(pk=pk, llm_api_key=stored).update(llm_api_key=fresh)
        self.stdout.write(f"rotate_llm_keys: {done} key(s) now under the first encryption key")
        if unreadable:
            raise CommandError(
                f"{len(unreadable)} stored key(s) could not be decrypted with any key of "
                f"AUTOWEB_ENCRYPTION_KEYS and were left as they are: {', '.join(unreadable)}. "
                "Put the old key back in the list, or set those keys again on the search page."
            )
