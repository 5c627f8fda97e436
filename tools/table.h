// A plain-text table for the CLI's human-readable output.
#pragma once

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void print(std::ostream& os) const {
    std::vector<size_t> w(header_.size(), 0);
    for (size_t i = 0; i < header_.size(); ++i) w[i] = header_[i].size();
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
    auto line = [&](const std::vector<std::string>& cells) {
      for (size_t i = 0; i < w.size(); ++i) {
        const std::string& c = i < cells.size() ? cells[i] : std::string();
        os << (i ? "  " : "") << c << std::string(w[i] - c.size(), ' ');
      }
      os << "\n";
    };
    line(header_);
    size_t total = 0;
    for (size_t x : w) total += x + 2;
    os << std::string(total > 2 ? total - 2 : 0, '-') << "\n";
    for (const auto& r : rows_) line(r);
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};
