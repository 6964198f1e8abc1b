"""`make bench`: figures printed as ratios against a baseline measured in the same run."""
