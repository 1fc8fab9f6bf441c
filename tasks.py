"""invoke's tasks for this checkout: the kit's namespace (`draftscope.cli.ns`), which the installed `draftscope`
command runs too.

`invoke` (or `inv`) hands its command line to the kit's own Program, the one `draftscope` is: the same help (each
option's type and default, the positional arguments in the usage line), the task list grouped by purpose, and one
`error:` line with the nearest match for a mistyped task or option. Imported any other way (a test, a tool reading
the namespace), this module only exposes `ns`.
"""

import sys
from pathlib import Path

from draftscope.cli import ns, program

__all__ = ["ns"]

if Path(sys.argv[0]).name in ("invoke", "inv"):
    program(binary=Path(sys.argv[0]).name).run(sys.argv)
    raise SystemExit(0)
