"""The benchmark lab: shaped hosts on one machine, workers, reports."""
