"""Which links and nodes a plan depends on: the what-if analysis and its views."""
