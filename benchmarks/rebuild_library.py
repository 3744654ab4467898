"""Rebuild an exported library directory from its manifest and the sketches its releases came from.

    python benchmarks/rebuild_library.py MANIFEST --sketches DIR --out DIR

An export (`manage.py export_library`) writes `manifest.json` and each release's source under
`kernels/`. The manifests of the benchmark runs are kept in docs/benchmarks/, their sources
are not: each was one knob setting of an engineer's sketch (`DIR/<problem>_tuned.py`). This
finds, for every release in MANIFEST, the knob setting of its problem's sketch whose source has
the release's `source_sha256`, and writes the library directory again: the manifest as it was
and each source byte for byte as released. A release no setting reproduces is an error, and
nothing is written. References are not written: inside autoweb, `kernels.library.load` takes
them from the problem registry.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels import knobs  # noqa: E402
from kernels.library import FORMAT, MANIFEST  # noqa: E402
from kernels.protocol import source_sha256  # noqa: E402


def find_source(sketch: str, sha: str) -> tuple[str, dict] | None:
    """The knob setting of `sketch` whose rewritten source has sha256 `sha`, and that source."""
    if source_sha256(sketch) == sha:
        return sketch, {}
    for setting in knobs.settings(knobs.parse_knobs(sketch)):
        text = knobs.rewrite(sketch, setting)
        if source_sha256(text) == sha:
            return text, setting
    return None


def rebuild(manifest_path: Path, sketches: Path, out: Path) -> list[dict]:
    """Write the library directory; returns what each release was rebuilt from."""
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"{manifest_path}: not a readable JSON manifest: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SystemExit(f"{manifest_path} is not a format-{FORMAT} autoweb library manifest")
    files: dict[str, str] = {}
    rebuilt = []
    for rel in manifest.get("releases", []):
        sketch_path = sketches / f"{rel['problem']}_tuned.py"
        if not sketch_path.is_file():
            raise SystemExit(f"release {rel['id']} ({rel['problem']}): no sketch {sketch_path}")
        hit = find_source(sketch_path.read_text(), rel["source_sha256"])
        if hit is None:
            raise SystemExit(
                f"release {rel['id']} ({rel['problem']}): no knob setting of {sketch_path} "
                f"has sha256 {rel['source_sha256']}"
            )
        files[rel["file"]] = hit[0]
        rebuilt.append(
            {"id": rel["id"], "problem": rel["problem"], "from": str(sketch_path), "knobs": hit[1]}
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    for name, text in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return rebuilt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest", type=Path)
    ap.add_argument("--sketches", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    for row in rebuild(args.manifest, args.sketches, args.out):
        print(f"release {row['id']} {row['problem']}: {row['from']} with {row['knobs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
