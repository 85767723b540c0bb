"""One module per benchmark section; each has run(ctx, reps) and records samples into ctx.rec."""
