// SPDX-License-Identifier: Apache-2.0
// dptrain's entry point: the command line (launcher/cli.h), with no test hooks.
#include "launcher/cli.h"

int main(int argc, char** argv) { return dptrain::RunCommandLine(argc, argv, {}); }
