"""An example plugin for fedem-private: the privacy mechanism ``ldp-gaussian-boxed``
(:mod:`fedem_plugin_example.mechanism`) and the attack ``rownorm``
(:mod:`fedem_plugin_example.attack`), registered through entry points (pyproject.toml).

Nothing here is imported by fedem-private itself; its loader
(``fedem_private.plugins``) calls the two ``register`` functions.
"""
