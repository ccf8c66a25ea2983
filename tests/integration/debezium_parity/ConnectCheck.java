// Reads Kafka records the way a Kafka Connect sink does and prints every refusal.
//
// Input: one record per line, "<topic>\t<key>\t<value>\t<headers>", key and value base64 ("-"
// for null), headers as "<name>=<base64 or ->" joined by ",". Keys and values go through
// org.apache.kafka.connect.json.JsonConverter with schemas.enable=true; "__debezium.*" headers
// through the same converter, every other header through Connect's default
// SimpleHeaderConverter. Output: "REFUSED\t<line>\t<part>\t<topic>\t<error>" per refusal, then
// "CHECKED\t<records>\t<conversions>\t<refusals>".
//
// Compiled and run by tests/integration/debezium_parity/connect_check.py against the
// connect-json jars of the Kafka version the stack runs.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.Map;

import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;

public final class ConnectCheck {
    private static int conversions = 0;
    private static int refusals = 0;

    private ConnectCheck() {
    }

    public static void main(String[] args) throws Exception {
        JsonConverter keys = new JsonConverter();
        keys.configure(Map.of("schemas.enable", "true"), true);
        JsonConverter values = new JsonConverter();
        values.configure(Map.of("schemas.enable", "true"), false);
        JsonConverter jsonHeaders = new JsonConverter();
        jsonHeaders.configure(Map.of("schemas.enable", "true", "converter.type", "header"));
        SimpleHeaderConverter simpleHeaders = new SimpleHeaderConverter();
        simpleHeaders.configure(Map.of());
        int records = 0;
        try (BufferedReader in = Files.newBufferedReader(Path.of(args[0]), StandardCharsets.UTF_8)) {
            String line;
            int number = 0;
            while ((line = in.readLine()) != null) {
                number++;
                if (line.isEmpty()) {
                    continue;
                }
                records++;
                String[] parts = line.split("\t", -1);
                String topic = parts[0];
                byte[] key = decode(parts[1]);
                byte[] value = decode(parts[2]);
                final int at = number;
                check(at, "key", topic, () -> keys.toConnectData(topic, key));
                check(at, "value", topic, () -> values.toConnectData(topic, value));
                if (parts.length > 3 && !parts[3].isEmpty()) {
                    for (String header : parts[3].split(",")) {
                        int eq = header.indexOf('=');
                        String name = header.substring(0, eq);
                        byte[] data = decode(header.substring(eq + 1));
                        if (name.startsWith("__debezium.")) {
                            check(at, "header " + name, topic,
                                    () -> jsonHeaders.toConnectHeader(topic, name, data));
                        }
                        else {
                            check(at, "header " + name, topic,
                                    () -> simpleHeaders.toConnectHeader(topic, name, data));
                        }
                    }
                }
            }
        }
        System.out.println("CHECKED\t" + records + "\t" + conversions + "\t" + refusals);
    }

    private interface Conversion {
        Object run() throws Exception;
    }

    private static void check(int line, String part, String topic, Conversion conversion) {
        conversions++;
        try {
            conversion.run();
        }
        catch (Exception e) {
            refusals++;
            String message = String.valueOf(e.getMessage()).replace('\n', ' ').replace('\t', ' ');
            System.out.println("REFUSED\t" + line + "\t" + part + "\t" + topic + "\t"
                    + e.getClass().getName() + ": " + message);
        }
    }

    private static byte[] decode(String field) {
        return field.equals("-") ? null : Base64.getDecoder().decode(field);
    }
}
