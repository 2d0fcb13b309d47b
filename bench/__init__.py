"""The benchmark suite behind ``ina bench``: one module ``bench_<name>`` per benchmark,
each with a ``main(argv)`` that parses its own flags (``--help`` runs nothing), prints
its figures and writes them with :func:`ina_fabric.bench._results.write`."""
