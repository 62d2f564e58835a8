"""How measurements are shown: the tables and JSON records of the benchmarks, the
performance page built from them, and loss curves of runs."""
