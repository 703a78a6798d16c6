"""The output directory of a checkpoint writer: created if missing, refused if it is a file or
holds anything unless `force` is given."""

from pathlib import Path


def prepare_out_dir(out_dir, force: bool) -> Path:
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(f"{out} is not empty; pass --force to overwrite its checkpoint files")
    out.mkdir(parents=True, exist_ok=True)
    return out
