"""Built-in behaviour packaged as plugins, registered exactly like third-party ones.

Each module here is listed in ``datamachine.plugins.DEFAULT_PLUGINS`` and implements hooks with
``@datamachine.hookimpl``; nothing in the host special-cases them.
"""
