"""What people see: the live console and `rlctl status` tables, text tables, learning curves, the bottleneck
verdict, the printed plan. Imported by the CLI and the supervisor's display; reads run directories and plans,
never imports torch."""
