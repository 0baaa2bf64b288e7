// Text formatting shared by the table, csv and dmon views.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace slipstream::smi {

// What nvidia-smi prints for a value that is unavailable (no GPU, unsupported, not yet known).
inline constexpr std::string_view kNotAvailable = "[N/A]";

// Text from a stats record (run, stage and pool names), which any process of the user can
// plant: control characters (C0, DEL, C1) become \n, \r, \t or \xHH so they cannot drive the
// terminal or break rows, and bytes that are not UTF-8 become \xHH.
std::string printable(std::string_view s);
// s as valid UTF-8 (each invalid byte becomes U+FFFD), for JSON output.
std::string valid_utf8(std::string_view s);

// Bounds past which a reading is absurd (a planted or damaged record) and prints as [N/A]
// (null in JSON), like NaN, infinities and negatives.
inline constexpr double kMaxSeconds = 3.2e9;  // 100 years: ETAs, latencies
inline constexpr double kMaxRate = 1e12;      // steps, samples or items per second
inline constexpr double kMaxFraction = 10;    // busy / wait fractions are 0..1, jitter aside
// v when finite and within [0, max], else nothing.
std::optional<double> plausible(double v, double max);

// A csv field quoted only when it has to be: a comma, quote, CR/LF, or leading/trailing
// space (nvidia-smi separates fields with ", ", so edge spaces would be lost). Quotes double.
std::string csv_escape(std::string_view field);
// Fields joined with ", " as nvidia-smi does; each field escaped.
std::string csv_join(const std::vector<std::string>& fields);

// A query value: its number (or text) without unit, or nothing when unavailable.
struct FieldValue {
  std::optional<std::string> text;
  std::string unit;  // appended as " unit" unless nounits; empty for unitless fields
};
// "[N/A]" when unavailable; "text unit" or, with units=false, "text".
std::string render_value(const FieldValue& v, bool units);
// csv header cell: "name [unit]" as nvidia-smi does, or "name" when unitless.
std::string header_cell(std::string_view name, std::string_view unit);

// printf("%.*f"); nullopt for NaN/inf so callers print [N/A].
std::optional<std::string> fixed(double v, int decimals);
std::string fixed_or_na(double v, int decimals, std::string_view suffix = {});
// Bytes as whole MiB (nvidia-smi's memory unit).
uint64_t to_mib(uint64_t bytes);
// Bytes for people: "512 B", "12.0 KiB", "1.50 GiB".
std::string human_bytes(uint64_t bytes);
// A rate in at most 8 characters: "12.34", "1600.0", "123.4k", "12.3M"; else "[N/A]".
std::string compact_rate(double per_s);
// Milliseconds for people: "0.081ms", "2.40ms", "312.5ms", "1.25s".
std::string latency_text(double ms);
// Seconds as "H:MM:SS" (or "Dd HH:MM:SS"); "[N/A]" when not plausible (kMaxSeconds).
std::string duration_text(double seconds);
// A fraction 0..1 as "95.0%"; "[N/A]" when not plausible (kMaxFraction).
std::string percent_text(double fraction);

// Concatenation by appending: GCC 12 at -O3 raises false -Wrestrict warnings on
// "literal" + std::string temporaries (GCC bug 105329).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(std::string_view(parts)), ...);
  return s;
}

// "P0".."P15".
std::string pstate_name(int pstate);

// Terminal columns `s` takes (UTF-8; East Asian wide characters and emoji 2 columns each).
size_t display_width(std::string_view s);
// Cut to `width` columns between characters, marking the cut with "..."; pad to width, text on
// the left or right.
std::string fit(std::string_view s, size_t width);
std::string pad_right(std::string_view s, size_t width);
std::string pad_left(std::string_view s, size_t width);
// Splits text into lines of at most width characters, breaking at spaces where it can.
std::vector<std::string> wrap(std::string_view text, size_t width);

}  // namespace slipstream::smi
