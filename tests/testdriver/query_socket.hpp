// The test driver's live objects, readable from outside its process (query_socket.cpp).
#pragma once

namespace mpsshim::testdriver {

// Listens on $MPSSHIM_TESTDRIVER_QUERY_SOCKET when it is set; called once, by the first
// successful cuInit.
void start_query_socket();

}  // namespace mpsshim::testdriver
