"""The kit's pinned images: names, the step → image map, `images/images.lock.json`, and engine argv.

Each image lives in `images/<name>/` (Dockerfile, requirements.in, hash-pinned requirements.lock);
`images/images.lock.json` records its reference, base (by digest where known), pinned versions, the lock
file's SHA-256 and the SHA-256 of the kit wheel it installs (`make dist` records it with `record_wheel`), and
`consistency_problems` checks that record against the Dockerfiles and lock files.

Everything here is pure and torch-free: functions return argv lists for `docker` or `podman` (the engine is
a parameter); `execute` is the one place that runs them. Build, pull, push and lock resolution need a checkout
(the Dockerfiles and the build context live there); the name → reference map works anywhere.

Split by concern: `draftscope.core.images` (names, the step map, references, the lock file), `lockfile` (Dockerfile
and lock-file parsing, consistency, the wheel's hash), `build` (provenance, CUDA architectures, build argv),
`registry` (pull, push, inspect, digests, `execute`), `sbom` (reading an image's SBOM back). This package re-exports
them for the tasks and tests.
"""

from draftscope.core.images import *  # noqa: F403
from draftscope.core.images import _check_name  # noqa: F401
from draftscope.ops.images.build import *  # noqa: F403
from draftscope.ops.images.lockfile import *  # noqa: F403
from draftscope.ops.images.lockfile import _COMMIT, _DIGEST  # noqa: F401
from draftscope.ops.images.publish import *  # noqa: F403
from draftscope.ops.images.registry import *  # noqa: F403
from draftscope.ops.images.sbom import *  # noqa: F403
