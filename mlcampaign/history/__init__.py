"""Campaign history: the runs of a campaign over time and across sites. The results store of every
run's records (store), bundles that move a run between sites (bundle), and the analyses over many
runs (merge, trends). docs/history.md describes the store's schema and URLs, and the bundle format."""
