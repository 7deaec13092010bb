"""``python -m chaos --seconds N --seed S``: run a chaos campaign and judge it.

Prints every fault and the verdict; ``--json PATH`` writes the summary too. Exit status 0 when
every check passed, 1 when one failed (the seed and the first violations are printed), 2 for a
bad flag.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import trio

from chaos import mutants
from chaos.campaign import Campaign, Options
from chaos.faults import BY_NAME
from chaos.mutants import MUTANTS
from chaos.report import write_json


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos", allow_abbrev=False,
        description="A real cluster on loopback (Redis under Sentinel, PostgreSQL, the simulator, a "
        "webhook receiver, three nodes, five jobs) under random faults from every layer; then "
        "every sink is checked exactly once and in order, the fencing and the election audited, "
        "and liveness held to the bound B of docs/FAILOVER.md.",
    )  # fmt: skip
    p.add_argument("--seconds", type=float, default=60.0, help="how long faults are injected (default 60)")
    p.add_argument(
        "--seed", type=int, default=None, help="the schedule's seed (default: a random one, printed)"
    )
    p.add_argument("--json", metavar="PATH", help="write the summary as JSON to PATH")
    p.add_argument("--kinds", default="", help="comma-separated fault kinds to draw from (default: all)")
    p.add_argument("--build", metavar="DIR", help="run the nodes from this copy of the code (PYTHONPATH)")
    p.add_argument(
        "--mutant",
        choices=sorted(MUTANTS),
        help="run the nodes from a deliberately broken copy of the code (the campaign must fail)",
    )
    p.add_argument("--ttl-ms", type=int, default=1500, help="the nodes' lease TTL (default 1500)")
    p.add_argument("--echo", action="store_true", help="print the nodes' log events as they come")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = [k for k in kinds if k not in BY_NAME]
    if unknown:
        print(f"--kinds: unknown {', '.join(unknown)}; known: {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    if not 5 <= args.seconds <= 7200:
        print(f"--seconds: between 5 and 7200, got {args.seconds}", file=sys.stderr)
        return 2
    build = args.build
    if args.mutant:
        build = str(mutants.build(args.mutant, Path(tempfile.mkdtemp(prefix=f"ingestion-{args.mutant}-"))))
        print(f"chaos: the nodes run mutant {args.mutant} from {build}", flush=True)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    options = Options(seconds=args.seconds, seed=seed, ttl_ms=args.ttl_ms, build=build, kinds=kinds,
                      echo=args.echo)  # fmt: skip
    campaign = Campaign(options, out=lambda s: print(s, flush=True))
    report = trio.run(campaign.run)
    print(report.text(), flush=True)
    if args.json:
        write_json(report, args.json, campaign.log, campaign.t0)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
