"""SPDX license detection from LICENSE/COPYING text."""

from __future__ import annotations

from pathlib import Path

import pytest

from sources.license import detect_license, identify_license

MIT = """MIT License

Copyright (c) 2024 Someone

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction..."""
BSD3 = """Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:
3. Neither the name of the copyright holder nor the names of its contributors may be used
   to endorse or promote products derived from this software without specific prior
   written permission."""
BSD2 = BSD3.split("3.")[0]


@pytest.mark.parametrize(("text", "spdx"), [
    (MIT, "MIT"),
    ("                                 Apache License\n                           Version 2.0, "
     "January 2004\n", "Apache-2.0"),
    (BSD3, "BSD-3-Clause"),
    (BSD2, "BSD-2-Clause"),
    ("GNU GENERAL PUBLIC LICENSE\nVersion 3, 29 June 2007", "GPL-3.0"),
    ("GNU LESSER GENERAL PUBLIC LICENSE\nVersion 2.1", "LGPL-2.1"),
    ("Permission to use, copy, modify, and/or distribute this software for any purpose with or "
     "without fee is hereby granted, provided that the above copyright notice ...", "ISC"),
    ("This is free and unencumbered software released into the public domain.", "Unlicense"),
    ("# SPDX-License-Identifier: MPL-2.0\n", "MPL-2.0"),
    ("All rights reserved. Do not copy.", None),
])
def test_identify(text, spdx):
    assert identify_license(text) == spdx


def test_detect_prefers_license_file_and_reports_missing(tmp_path: Path):
    assert detect_license(tmp_path)[0] is None
    (tmp_path / "COPYING.txt").write_text("All rights reserved.")
    spdx, why = detect_license(tmp_path)
    assert spdx is None and "not recognized" in why
    (tmp_path / "LICENSE").write_text(MIT)
    assert detect_license(tmp_path) == ("MIT", "LICENSE")
