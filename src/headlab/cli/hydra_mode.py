"""One composition of the config per command instead of two.

Hydra composes the whole config once only to read ``hydra.mode`` (``Hydra.get_mode``), then again to run the command:
the first costs 0.4 s of every start on 2 cores (half of what a mistyped command takes to be refused). Of headlab's
configs only the sweep presets (``conf/experiment/``) set ``hydra.mode``, so a command whose overrides name no
experiment and not ``hydra.mode`` runs in the mode its command line says (``-m``: a multirun, else one run), and its
first composition is skipped. A command that names one is composed twice, as Hydra does. (A config of your own that
sets ``hydra.mode`` outside ``experiment/`` is not read for the mode: give ``-m``.)
"""

from __future__ import annotations

from collections.abc import Sequence

MODE_GROUP, MODE_KEYS = "experiment", ("hydra", "hydra.mode")  # what can set hydra.mode


def may_set_mode(overrides: Sequence[str]) -> bool:
    """Whether an override names the experiment group (``experiment=``, ``+experiment=``, ``experiment/...``) or
    ``hydra.mode`` itself (``hydra.run.dir=`` and ``hydra/launcher=`` do not set the mode)."""
    keys = [override.lstrip("+~").split("=", 1)[0] for override in overrides]
    return any(key in MODE_KEYS or key.split(".", 1)[0].split("/", 1)[0] == MODE_GROUP for key in keys)


def compose_once() -> None:
    """Make ``Hydra.get_mode`` compose only for the commands whose overrides ``may_set_mode``; None (the command
    line's mode) for the others."""
    from hydra._internal.hydra import Hydra

    composing = Hydra.get_mode
    if getattr(composing, "composes_once", False):
        return

    def get_mode(self, config_name, overrides):
        return composing(self, config_name, overrides) if may_set_mode(overrides) else None

    get_mode.composes_once = True
    Hydra.get_mode = get_mode
