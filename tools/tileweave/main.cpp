// Placeholder until the CLI lands (issue 2).
#include <cstdio>
int main() { std::puts("tileweave: CLI under construction"); return 0; }
