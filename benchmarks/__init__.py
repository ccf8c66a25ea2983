"""The benchmark harness behind ``make bench``.

Each measurement is a separate function that can be run alone (see :mod:`benchmarks.runner`);
a component that is not there yet yields "not measured: <reason>", never a made-up figure.
"""
