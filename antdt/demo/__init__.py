"""`make demo`: a small real training job with a straggler, run without and with AntDT."""
