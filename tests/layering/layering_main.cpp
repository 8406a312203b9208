// Linked with one layer library, whole archive (tests/layering/CMakeLists.txt):
// building it is the check, running it does nothing.
int main() { return 0; }
