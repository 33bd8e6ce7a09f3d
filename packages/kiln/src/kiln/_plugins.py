"""Discovery of Kiln's plug-ins through entry points.

Code generators register in the ``kiln.codegen`` group and runtimes in ``kiln.runtime``.
Each group is loaded once per process: a plug-in whose import fails is skipped, and the
reason is kept so that ``kiln.list_backends()`` can show it.
"""

from __future__ import annotations

import functools
import logging
import traceback
from dataclasses import dataclass
from importlib import metadata

log = logging.getLogger("kiln.plugins")

CODEGEN_GROUP = "kiln.codegen"
RUNTIME_GROUP = "kiln.runtime"
PLUGIN_GROUPS = (CODEGEN_GROUP, RUNTIME_GROUP)


@dataclass(frozen=True)
class Plugin:
    """One entry point of a Kiln plug-in group, loaded or not."""

    group: str
    name: str
    target: str
    distribution: str | None
    version: str | None
    obj: object | None = None
    error: str | None = None

    @property
    def loaded(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        origin = f"{self.distribution} {self.version}" if self.distribution else self.target
        state = "loaded" if self.loaded else f"failed to load: {self.error}"
        return f"{self.group}:{self.name} ({origin}) {state}"


def _load_entry_point(entry_point: metadata.EntryPoint) -> Plugin:
    dist = entry_point.dist
    fields = dict(
        group=entry_point.group,
        name=entry_point.name,
        target=entry_point.value,
        distribution=dist.name if dist is not None else None,
        version=dist.version if dist is not None else None,
    )
    try:
        obj = entry_point.load()
    except Exception as exc:  # a broken plug-in must not take the others down
        reason = "".join(traceback.format_exception_only(exc)).strip()
        log.warning("skipping plug-in %s:%s: %s", entry_point.group, entry_point.name, reason)
        return Plugin(**fields, error=reason)
    return Plugin(**fields, obj=obj)


@functools.cache
def load_plugins(group: str) -> tuple[Plugin, ...]:
    """Load every entry point of ``group`` once per process, sorted by name."""
    entry_points = sorted(metadata.entry_points(group=group), key=lambda ep: ep.name)
    return tuple(_load_entry_point(ep) for ep in entry_points)


def list_backends() -> list[Plugin]:
    """The installed code generators and runtimes, including those that failed to load.

    A plug-in that failed keeps the exception that stopped it in ``error``; it is never
    used for compilation.
    """
    return [plugin for group in PLUGIN_GROUPS for plugin in load_plugins(group)]
