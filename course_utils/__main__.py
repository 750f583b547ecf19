"""`python -m course_utils COMMAND`: lab, test, install, doctor, build, grade, bench, prove."""
from __future__ import annotations

import argparse
import sys


def _lesson_number(text: str) -> str:
    """--lesson 2, 02: "02", a lesson of the course; argparse's usage error otherwise."""
    from .lessons_index import lesson_number

    try:
        return lesson_number(text)
    except KeyError as exc:
        raise argparse.ArgumentTypeError(exc.args[0]) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("lab", help="install into .venv and start JupyterLab on the notebooks")
    sub.add_parser("test", help="install into .venv (with test tools) and run the test suite")
    p = sub.add_parser("install", help="create or refresh .venv")
    p.add_argument("--tests", action="store_true", help="also install the test tools")
    sub.add_parser("doctor", help="versions, GPU, a tiny kernel, and what each lesson needs")
    p = sub.add_parser("build", help="generate the notebooks, the README's course map and results tables from their sources")
    p.add_argument("--check", action="store_true", help="fail on drift, outputs or machine paths instead")
    p = sub.add_parser("grade", help="grade exercise notebooks (files or folders)")
    p.add_argument("paths", nargs="+")
    p.add_argument("--timeout", type=int, default=600, help="seconds per notebook")
    p.add_argument("--report", default="grades", help="write REPORT.json and REPORT.csv")
    p.add_argument("--jobs", type=int, default=1, help="notebooks graded at once")
    p.add_argument("--seed", type=int, default=None, help="one seed for every check (reproducible grading)")
    p.add_argument("--memory", type=float, default=None, help="GiB of data memory per sandbox (3, 16 on a GPU)")
    p.add_argument("--lesson", type=_lesson_number, default=None,
                   help="score every notebook on this lesson's exercises (default: the lesson most notebooks check)")
    p = sub.add_parser("bench", help="run a lesson's GPU benchmarks and write results/")
    p.add_argument("lessons", nargs="*", help="lesson numbers (default: all)")
    p = sub.add_parser("prove", help="on a GPU: execute lesson + solution notebooks, bench, write results/")
    p.add_argument("lessons", nargs="*", help="lesson numbers (default: all)")
    p.add_argument("--notebooks-only", action="store_true",
                   help="execute the notebooks and record it; keep the figures this GPU's results file holds")
    args, rest = parser.parse_known_args(argv)

    if args.command in ("lab", "test", "install"):
        from . import install

        if args.command == "lab":
            install.lab(rest)
        if args.command == "test":
            return install.test(rest)
        install.install(tests=args.tests)
        return 0
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "doctor":
        from .doctor import doctor
        from .mode import setup

        setup(quiet=True)  # the GPU when there is one, else the interpreter: before the tiny kernel exists
        return 0 if doctor() else 1
    if args.command == "build":
        from .build import build

        problems = build(check=args.check)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if args.command == "grade":
        from .grading.batch import main as grade_main
        from .grading.sandbox import Limits

        return grade_main(args.paths, timeout=args.timeout, report=args.report, jobs=args.jobs, seed=args.seed,
                          limits=Limits(memory=int(args.memory * (1 << 30))) if args.memory else None,
                          lesson=args.lesson)
    if args.command == "bench":
        from .mode import setup

        setup("gpu")
        from . import benches

        return 0 if benches.run_all(args.lessons) else 1
    if args.command == "prove":
        from .mode import setup

        setup("gpu")
        from .prove import prove

        return 0 if prove(args.lessons, bench=not args.notebooks_only) else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
