"""Privacy mechanisms as objects (docs/design.md section 5), one module per mechanism.

Each module defines one :class:`~fedem_private.privacy.mech.base.Mechanism`
subclass and registers it under its ``--privacy`` name with
:func:`fedem_private.privacy.registry.register`. The modules import nothing heavy at
the top (no torch, no dp-accounting): validating a configuration or listing the
mechanisms stays cheap; the numerical code is imported when a hook runs.
"""
