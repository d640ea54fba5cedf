"""One plan priced end to end: layout rules, the Evaluator and its data-parallel and group parts."""
