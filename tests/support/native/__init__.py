"""Small native helpers the tests build on demand (a C compiler is on every CI machine)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent


@cache
def clockshift_library() -> str | None:
    """Build ``clockshift.so`` (see clockshift.c) once per test run; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = Path(tempfile.mkdtemp(prefix="ingestion-native-")) / "clockshift.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(HERE / "clockshift.c")], check=True
    )
    return str(out)


def clockshift_env(shift_file: Path, shift_ms: int = 0) -> dict[str, str]:
    """Environment for a process whose wall clock the test steps by rewriting ``shift_file``."""
    library = clockshift_library()
    assert library is not None, "no C compiler to build the clock shim"
    shift_file.write_text(f"{shift_ms}\n")
    return {"LD_PRELOAD": library, "CLOCK_SHIFT_FILE": str(shift_file)}
