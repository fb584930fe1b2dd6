// What DBeaver and Metabase do on connect, through PostgreSQL's own JDBC driver (Debian's
// libpostgresql-jdbc-java): read the catalogue, run a prepared query (five times, so the driver
// switches to a named server-side statement and binary results), and try a write. Prints one
// line of JSON; tests/it/console.rs judges it.
//
// usage: java -cp /usr/share/java/postgresql.jar tests/jdbc/LakeProbe.java JDBC_URL
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;

public class LakeProbe {
    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\');
            if (c < 0x20) b.append(String.format("\\u%04x", (int) c)); else b.append(c);
        }
        return b.append('"').toString();
    }

    static String list(List<String> items) {
        List<String> q = new ArrayList<>();
        for (String s : items) q.add(quote(s));
        return "[" + String.join(",", q) + "]";
    }

    public static void main(String[] args) throws Exception {
        try (Connection c = DriverManager.getConnection(args[0], "analyst", "")) {
            DatabaseMetaData md = c.getMetaData();
            List<String> tables = new ArrayList<>();
            try (ResultSet rs = md.getTables(null, null, "%", new String[] {"TABLE"})) {
                while (rs.next()) tables.add(rs.getString("TABLE_NAME"));
            }
            List<String> columns = new ArrayList<>();
            try (ResultSet rs = md.getColumns(null, null, "pull_requests", "%")) {
                while (rs.next()) columns.add(rs.getString("COLUMN_NAME"));
            }
            List<String> rows = new ArrayList<>();
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT repo_name, number FROM pull_requests WHERE number >= ? ORDER BY repo_name, number")) {
                for (int run = 0; run < 5; run++) {
                    rows.clear();
                    ps.setLong(1, 0);
                    try (ResultSet rs = ps.executeQuery()) {
                        while (rs.next()) rows.add(rs.getString(1) + "|" + rs.getLong(2));
                    }
                }
            }
            String insertState;
            try (Statement st = c.createStatement()) {
                st.executeUpdate("INSERT INTO pull_requests (repo_name, number) VALUES ('x/y', 1)");
                insertState = "none";
            } catch (SQLException e) {
                insertState = e.getSQLState();
            }
            System.out.println("{\"product\":" + quote(md.getDatabaseProductName() + " " + md.getDatabaseProductVersion())
                    + ",\"tables\":" + list(tables) + ",\"columns\":" + list(columns) + ",\"rows\":" + list(rows)
                    + ",\"insert_sqlstate\":" + quote(insertState) + "}");
        }
    }
}
