"""What a job's experiment trackers left in its directory, listed and downloadable."""
