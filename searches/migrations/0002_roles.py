"""The two role groups (see core/roles.py)."""

from __future__ import annotations

from django.db import migrations

ROLES = ("engineers", "reviewers")


def create_groups(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.get_or_create(name=name)


def delete_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("searches", "0001_initial"),
    ]

    operations = [migrations.RunPython(create_groups, delete_groups)]
