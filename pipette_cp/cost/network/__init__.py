"""Communication over the measured links: the fabric, collectives, NCCL's rings, data-parallel and expert/context groups."""
