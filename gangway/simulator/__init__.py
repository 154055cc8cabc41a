"""The simulator: job traces replayed through the scheduling core in simulated time."""
