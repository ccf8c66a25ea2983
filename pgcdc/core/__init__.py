"""The shared kernel: settings, errors, values, ``Lsn``, ports and the Kafka contract.

Every other package imports from here; nothing here imports another package of the project.
``ports`` and ``contract`` use the standard library only, so the stack tooling can import
them before the virtual environment exists.
"""
