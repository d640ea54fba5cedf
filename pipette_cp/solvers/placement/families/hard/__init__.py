"""The hard families of the placement master: rows every placement must satisfy, each
refused in a plan by the checker function it names (``check``), and a user's
constraint families."""
