"""`python manage.py import_reports FILE_OR_DIR... --user USERNAME [--problem P] [--kind K]
[--candidate FILE]`: import harness reports measured on other hosts (searches/imports.py).

A directory imports every `*.json` file in it. Each file imports whole or not at all; a bad
one is reported and the others still import. The exit status is 1 when any file failed."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from searches import imports


class Command(BaseCommand):
    help = "Import `python -m kernels evaluate --json` reports (or bundles of them) as trials."

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", metavar="FILE_OR_DIR")
        parser.add_argument("--user", required=True, help="who imports (recorded with each)")
        parser.add_argument(
            "--problem", action="append", help="only reports of this problem (repeatable)"
        )
        parser.add_argument(
            "--kind", action="append", help="only reports of this GPU kind (repeatable)"
        )
        parser.add_argument(
            "--candidate",
            help="the source file a single report judged, for a report that does not carry it",
        )

    def handle(self, *args, paths, user, problem, kind, candidate, **options):
        who = get_user_model().objects.filter(username=user).first()
        if who is None:
            raise CommandError(f"no user {user!r}")
        source = None
        if candidate is not None:
            try:
                source = Path(candidate).read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise CommandError(f"cannot read the candidate {candidate!r}: {e}") from e
        files: list[Path] = []
        for raw in paths:
            path = Path(raw)
            if path.is_dir():
                found = sorted(path.glob("*.json"))
                if not found:
                    raise CommandError(f"{path} holds no .json files")
                files += found
            elif path.exists():
                files.append(path)
            else:
                raise CommandError(f"{path} does not exist")
        if source is not None and len(files) != 1:
            raise CommandError("--candidate goes with exactly one report file")
        failed = []
        for path in files:
            try:
                out = imports.import_file(
                    path, user=who, problems=problem, kinds=kind, candidate=source
                )
            except imports.ReportImportError as e:
                failed.append(str(path))
                self.stderr.write(f"not imported: {' '.join(e.messages)}")
                continue
            self.stdout.write(
                f"{path}: {len(out.imported)} imported, {len(out.already)} already imported"
                + (f", {len(out.skipped)} skipped" if out.skipped else "")
            )
            for trial in out.imported:
                self.stdout.write(
                    f"  trial {trial.index} of search #{trial.search_id}: {trial.rationale}"
                )
            for why in out.skipped:
                self.stdout.write(f"  skipped {why}")
        if failed:
            raise CommandError(f"{len(failed)} of {len(files)} files not imported")
