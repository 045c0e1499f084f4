// CSV as RFC 4180 writes it: a field holding a comma, a double quote or a line break is quoted, its quotes
// doubled, so a standard reader (Python's csv, pandas) gets every row at one field count. explore's layout
// strings hold commas (layers=1,2x62,1).
#pragma once

#include <string>
#include <vector>

namespace tessel {

std::string csv_field(const std::string& s);
// The fields joined by commas, quoted where needed, ending in "\n".
std::string csv_row(const std::vector<std::string>& fields);

}  // namespace tessel
