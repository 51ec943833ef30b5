#!/usr/bin/env python
"""Builds the jax-ipu wheel into dist/ (Graphcore's users know the command):

    python build/build.py --enable_ipu

Stock jax and jaxlib come from the package index; jax-ipu is the PJRT
plugin beside them, so --enable_ipu is the only kind of build there is.
"""
import argparse
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--enable_ipu", action="store_true", help="build the IPU PJRT plugin wheel")
    parser.add_argument("--output_path", default=str(ROOT / "dist"), help="where the wheel goes (default: dist/)")
    args = parser.parse_args(argv)
    if not args.enable_ipu:
        parser.error("jax-ipu builds only the IPU plugin: pass --enable_ipu "
                     "(install stock jax and jaxlib from the package index)")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", args.output_path, str(ROOT)]
    print("+", " ".join(command), flush=True)
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
