from django.db import migrations, models


def count(apps, schema_editor):
    """The counts of every stored release's per-shape table, as Release.count_dispatch makes
    them: rows with who serves the shape (releases made before the table have none: 0 of 0)."""
    Release = apps.get_model("library", "Release")
    for rel in Release.objects.only("pk", "shapes").iterator():
        rows = [
            row
            for row in rel.shapes or []
            if isinstance(row, dict) and row.get("serve") and isinstance(row.get("shape"), dict)
        ]
        Release.objects.filter(pk=rel.pk).update(
            dispatch_total=len(rows),
            dispatch_on_kernel=sum(1 for row in rows if row["serve"] == "kernel"),
        )


class Migration(migrations.Migration):
    dependencies = [("library", "0002_release_page_indexes")]

    operations = [
        migrations.AddField(
            model_name="release",
            name="dispatch_total",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="release",
            name="dispatch_on_kernel",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AlterField(
            model_name="release",
            name="shapes",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text=(
                    "Per-shape measurements from re-validation, each with who serves the shape."
                ),
            ),
        ),
        migrations.RunPython(count, migrations.RunPython.noop),
    ]
