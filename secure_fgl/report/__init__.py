"""Privacy/utility reports from the run files of a sweep (``secure-fgl report``)."""
