"""The native local stack behind ``scripts/stack``: standard library only.

It must run on the system ``python3`` before the project's virtualenv exists, so nothing
here may import a third-party package.
"""
