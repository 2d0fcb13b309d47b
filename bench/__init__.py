"""The benchmark suite behind ``ina bench``: one module ``bench_<name>`` per benchmark,
each with a ``main(argv)`` that parses its own flags (``--help`` runs nothing), prints
its figures and writes them with :func:`ina_fabric.bench._results.write`."""


def set_results_dir(path) -> None:
    """Where :func:`ina_fabric.bench._results.write` puts the figures (``ina bench --out``)."""
    import pathlib
    from . import _results
    _results.RESULTS = pathlib.Path(path)
