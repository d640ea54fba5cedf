"""One plan priced end to end: layout rules, the Evaluator and the parts it holds (the
data-parallel collectives, the expert groups' costs) with their shared caches."""
