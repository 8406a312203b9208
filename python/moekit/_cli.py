"""The `moekit` command a wheel installs: runs the command line binary the wheel carries in moekit/_bin/
(the same program as a source build's build/moekit), with the arguments it was given."""
import os
import sys


def main() -> None:
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "moekit")
    if not os.access(binary, os.X_OK):
        sys.exit(f"moekit: no command line binary at {binary}: this package was built without it "
                 "(a source build has it in build/moekit)")
    os.execv(binary, [binary, *sys.argv[1:]])
