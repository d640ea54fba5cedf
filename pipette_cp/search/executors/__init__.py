"""Where the search's work runs: this process, worker processes, or Ray actors."""
