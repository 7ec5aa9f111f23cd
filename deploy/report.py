"""How the checks of deploy/ and docs/ end: each problem found printed on
its own line, then, if there was any, an exit with status 1 and a line
counting them."""

import sys


def exit_on(problems, what):
    """Prints `problems` (strings) and exits when there is any, with
    "<count> <what>" (e.g. "2 problem(s) in the packages")."""
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(f"{len(problems)} {what}")
