"""What a user describes: run configs and their schema, models and layers, software stacks, batch schedules, units, errors, input limits."""
