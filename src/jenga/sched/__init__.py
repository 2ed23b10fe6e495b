"""The torch-free scheduler, sequences and sampling parameters shared by the engine and the simulator."""
