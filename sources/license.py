"""Detect a repository's license (SPDX id) from its LICENSE / COPYING files."""

from __future__ import annotations

import re
from pathlib import Path

LICENSE_FILE = re.compile(r"^(LICEN[CS]E|COPYING|UNLICENSE)([-._].*)?$", re.IGNORECASE)
_SPDX_TAG = re.compile(r"SPDX-License-Identifier:\s*([A-Za-z0-9.+-]+)")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def identify_license(text: str) -> str | None:
    """SPDX id of a license text, by the phrases each license must contain; None if unknown."""
    tag = _SPDX_TAG.search(text)
    if tag:
        return tag.group(1)
    t = _norm(text)
    if "gnu affero general public license" in t:
        return "AGPL-3.0"
    if "gnu lesser general public license" in t:
        return "LGPL-3.0" if "version 3" in t else "LGPL-2.1"
    if "gnu general public license" in t:
        return "GPL-3.0" if "version 3" in t else "GPL-2.0"
    if "apache license" in t and "version 2.0" in t:
        return "Apache-2.0"
    if "mozilla public license" in t and "2.0" in t:
        return "MPL-2.0"
    if "boost software license" in t:
        return "BSL-1.0"
    if "this is free and unencumbered software released into the public domain" in t:
        return "Unlicense"
    if "cc0 1.0 universal" in t:
        return "CC0-1.0"
    if "python software foundation license" in t:
        return "PSF-2.0"
    if "permission is hereby granted, free of charge" in t:
        return "MIT"
    if "permission to use, copy, modify, and/or distribute this software for any purpose" in t:
        # ISC requires keeping the notice; 0BSD drops that condition
        return "ISC" if "provided that the above copyright notice" in t else "0BSD"
    if "redistribution and use in source and binary forms" in t:
        if "endorse or promote products" in t:
            return "BSD-3-Clause"
        return "BSD-2-Clause"
    if "altered source versions must be plainly marked" in t:
        return "Zlib"
    return None


def license_files(repo_dir: Path) -> list[Path]:
    """LICENSE/COPYING-like files at the repository root, shortest name first."""
    if not repo_dir.is_dir():
        return []
    found = [p for p in repo_dir.iterdir() if p.is_file() and LICENSE_FILE.match(p.name)]
    return sorted(found, key=lambda p: (len(p.name), p.name))


def detect_license(repo_dir: Path) -> tuple[str | None, str]:
    """(SPDX id or None, the file it came from or why none was found)."""
    files = license_files(repo_dir)
    if not files:
        return None, "no LICENSE or COPYING file at the repository root"
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")[:200_000]
        except OSError:
            continue
        spdx = identify_license(text)
        if spdx:
            return spdx, path.name
    return None, f"{files[0].name}: license text not recognized"
