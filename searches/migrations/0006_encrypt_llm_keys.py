"""API keys stored in plain text are encrypted (searches/crypto.py); rows already encrypted are
left as they are, so running it again changes nothing."""

from django.db import migrations

from searches import crypto


def encrypt_stored_keys(apps, schema_editor):
    """Keys saved in plain text before keys were encrypted: encrypted now."""
    Search = apps.get_model("searches", "Search")
    for search in Search.objects.exclude(llm_api_key="").only("pk", "llm_api_key").iterator():
        if not crypto.is_encrypted(search.llm_api_key):
            search.llm_api_key = crypto.encrypt(search.llm_api_key)
            search.save(update_fields=["llm_api_key"])


def decrypt_stored_keys(apps, schema_editor):
    """Back to plain text, which is what the code before this migration reads."""
    Search = apps.get_model("searches", "Search")
    for search in Search.objects.exclude(llm_api_key="").only("pk", "llm_api_key").iterator():
        search.llm_api_key = crypto.decrypt(search.llm_api_key)
        search.save(update_fields=["llm_api_key"])


class Migration(migrations.Migration):
    dependencies = [
        ("searches", "0005_llm_endpoints"),
    ]

    operations = [
        migrations.RunPython(encrypt_stored_keys, decrypt_stored_keys),
    ]
