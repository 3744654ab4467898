"""`manage.py export_library`: active releases as a library directory or a standalone wheel."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from library import export


class Command(BaseCommand):
    help = (
        "Write active releases (optionally of some problems / GPU kinds) as a directory or wheel."
    )

    def add_arguments(self, parser):
        parser.add_argument("--out", required=True, help="directory (or, with --wheel, a folder)")
        parser.add_argument("--problem", action="append", default=[], help="repeatable")
        parser.add_argument("--kind", action="append", default=[], help="repeatable")
        parser.add_argument("--wheel", action="store_true", help="write a wheel into --out")
        parser.add_argument("--package", default="autoweb_kernels")
        parser.add_argument("--pkg-version", dest="pkg_version", default="0.1.0")

    def handle(self, *args, out, problem, kind, wheel, package, pkg_version, **options):
        releases = export.select(problem, kind)
        out_path = Path(out)
        try:
            if wheel:
                name, data = export.wheel_bytes(
                    releases, package=package, version=pkg_version, extra_problems=problem
                )
                out_path.mkdir(parents=True, exist_ok=True)
                (out_path / name).write_bytes(data)
                self.stdout.write(f"{out_path / name}: {len(releases)} release(s)")
            else:
                export.write_dir(releases, out_path, extra_problems=problem)
                self.stdout.write(f"{out_path}: {len(releases)} release(s)")
        except export.ExportError as e:
            raise CommandError(str(e)) from e
        except OSError as e:
            raise CommandError(f"cannot write {out_path}: {e.strerror or e}") from e
